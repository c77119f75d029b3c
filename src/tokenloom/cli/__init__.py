"""The ``tokenloom`` command line: thin commands over the library, one error boundary."""
