"""``python -m mice_exp.gate model=... input=...``: the ``mice-exp gate`` command."""

from mice_exp.gate.command import main

if __name__ == "__main__":
    main()
