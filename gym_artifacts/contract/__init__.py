"""The backend contract: the hooks a backend implements and the types they deal in, the base
classes (post-run ``Exporter``, live ``LiveExporter``), what a backend is given from one run
(``RunPayload``) and the registry that finds backends and checks them at load.

A backend imports none of this directly: it imports the facade ``gym_artifacts.plugin``.
"""
