"""Built-in backends, one module each, registered through the ``gym_artifacts.exporters`` group."""
