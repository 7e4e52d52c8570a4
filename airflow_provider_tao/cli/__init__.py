"""``airflow tao``: the provider's command group (registered through the provider info's ``cli`` entry)."""
