"""symparam: exact, closed-form parameter counts of transformer language models, as SymPy expressions."""

from symparam import symbols
from symparam.errors import SymparamError
from symparam.model import Count, Model, family, load

__all__ = ["symbols", "SymparamError", "Count", "Model", "family", "load"]
