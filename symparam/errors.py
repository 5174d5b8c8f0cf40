"""The one root exception: every user-facing failure is a SymparamError with a one-line message."""


class SymparamError(Exception):
    """A problem with the user's input, reported as one line naming the field and the problem."""
