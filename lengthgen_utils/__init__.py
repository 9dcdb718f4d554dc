"""lengthgen_utils: the shared package of the lengthgen book.

Data flows one way: ``tasks`` -> ``models`` -> ``training`` -> ``evaluation``
/ ``analysis`` -> ``plots``. Only ``plots`` and ``widgets`` import plotly or
ipywidgets.
"""
__version__ = "0.1.0"
