"""What several platforms share: the container layer, running a platform CLI, the job environment and secrets."""
