"""Kernel DSL backends: one package each, registering a :class:`attngen.registry.BackendInfo`."""
