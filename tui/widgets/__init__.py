"""Widgets shared by the tabs: drawing a model part by part (`drawing`), a DataTable that draws a
cell once per change (`fast_table`), a sparkline (`spark`). Each tab's own widget lives in its
folder (tui/tabs/<tab>/widget.py)."""
