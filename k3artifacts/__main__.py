from k3artifacts.cli import main

# Guarded: tests import every module of the package (tests/test_exit_codes.py).
if __name__ == "__main__":
    main()
