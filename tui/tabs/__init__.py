"""One folder per tab: its figures (pure), its at-scale view, its rendering (Rich text), its model
(what the widget draws), its widget and its panel (state in, model out)."""
