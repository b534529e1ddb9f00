"""The Memory tab: what each rank holds beside the cost model, and which strategy would fit."""
