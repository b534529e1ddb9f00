"""One interface for the tabs' panels: a `Frame` in (the run's state as of this refresh and the
app's choices), the model its widget draws out. The app's refresh is a lookup over them, so a tab
is added by adding a panel, not a branch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from ringtop.tui.large_run.nav import OverviewNav
from ringtop.tui.state.view_model import RunView


@dataclass(frozen=True)
class Frame:
    """What every panel draws from, fixed for one refresh. `view` is the app's own fold, read and
    not copied (a copy per refresh would cost O(ranks)); panels only read it."""

    view: RunView
    now: float
    replay: bool
    navs: Mapping[str, OverviewNav]
    """A large run's table per tab that has one: the node opened, the sort, the filter, the rows."""
    comm_rank: int | None = None
    """The Comm tab's selection: a rank, or None for all ranks."""
    hang_rank: int | None = None
    """The Hang view's cursor: the rank whose stack it shows."""
    screen_width: int = 0


@dataclass(frozen=True)
class Built:
    """A panel's model, and for a windowed table what Enter opens and how many rows a page holds."""

    model: Any
    cursor_key: str | None = None
    page_rows: int | None = None
    """None: the tab has no large run's table."""


class Panel(Protocol):
    tab: str
    """The tab's id (TabPane id, `1`…`6` key order in the app)."""
    widget: type
    """The widget class on the tab that draws the model (its `show(model)`)."""

    def build(self, frame: Frame, widget: Any) -> Built:
        """The model for `widget`, from `frame`; sizes (table width, rows on screen) from the widget."""
        ...
