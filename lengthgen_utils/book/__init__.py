"""What the chapters show: rendering, sliders, tables, figures, the checks and the scoreboard.

The only part of the package that imports plotly or ipywidgets.
"""
