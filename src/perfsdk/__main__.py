"""``python -m perfsdk`` (and ``torchrun -m perfsdk``) runs the CLI."""

from perfsdk.cli import main

main()
