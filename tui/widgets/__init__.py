"""The UI's panels: one widget per panel, each with its own CSS, drawing an immutable model that
the app builds from the view model (tui/*_tab.py). A widget computes nothing about the run."""

from .comm import CommModel, CommPanel
from .events import EventsModel, EventsPanel
from .hang import HangBanner, HangModel, HangPanel
from .header import HeaderModel, RunHeader
from .memory import MemoryModel, MemoryPanel
from .overview import Chart, OverviewModel, OverviewPanel
from .pipeline import PipelineModel, PipelinePanel

__all__ = ["Chart", "CommModel", "CommPanel", "EventsModel", "EventsPanel", "HangBanner", "HangModel", "HangPanel",
           "HeaderModel", "MemoryModel", "MemoryPanel", "OverviewModel", "OverviewPanel", "PipelineModel",
           "PipelinePanel", "RunHeader"]
