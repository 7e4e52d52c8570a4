"""TaskFlow decorators of the provider: ``@task.tao`` (declared in provider info ``task-decorators``)."""
