"""Hyperparameter search for :class:`~airflow_provider_tao.operators.automl.TAOAutoMLOperator`: the search space
(:mod:`.space`), live metrics read from the trials' logs (:mod:`.metrics`) and the study's state with the Optuna
bridge (:mod:`.study`). Optuna is imported only when a search runs."""
