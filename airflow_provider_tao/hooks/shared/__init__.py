"""What several platforms share: the container layer and running a platform CLI."""
