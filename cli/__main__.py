"""``python -m mlx_integrations.cli``: the ``mlxi`` command, where no script is installed."""

from mlx_integrations.cli.main import main

main()
