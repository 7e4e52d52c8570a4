"""The provider's Airflow plugin: the "TAO jobs" view and the job pages, served by the API server."""
