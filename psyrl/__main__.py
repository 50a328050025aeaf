"""`python -m psyrl ...` (and `torchrun ... -m psyrl build ...`): the `psyrl` command group."""

from psyrl.cli.main import main

main(prog_name="psyrl")
