"""`python -m qgate` is the `qgate` command."""

from qgate.entry import main

if __name__ == "__main__":
    main()
