"""The ``mlxi`` command line (installed as ``mlx_integrations.cli``)."""
