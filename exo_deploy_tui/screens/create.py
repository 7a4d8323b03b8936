"""The create form (``n``): a searchable catalog from /models and the deployment's options.

It stays open until the master accepts, showing the master's own refusal if it says no, so
an operator never has to retype a form to fix one field. It reads the catalog and the model
through the ``ClusterSource`` it is given and asks the app to create with ``CreateRequested``,
whose answer says whether to close.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Footer, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from exo_deploy_tui.feed.client import ApiError
from exo_deploy_tui.model.format import short_model
from exo_deploy_tui.screens.contract import ClusterSource, CreateRequested
from exo_deploy_tui.screens.master_form import MasterForm
from exo_deploy_tui.view.forms import (
    check_replicas,
    fit_hint,
    no_match,
    search_models,
    validate_create,
)
from keeper.model.api_models import ModelListEntry, model_entry
from keeper.model.catalog import BUILTIN_MODEL_CARDS
from keeper.model.state import MAX_REPLICAS, InstanceMeta, Sharding


def _option_text(entry: ModelListEntry, deployed: bool) -> Text:
    size = entry.storage_size_megabytes / 1024
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{short_model(entry.id):<30}", style="dim" if deployed else "bold")
    # A stock exo's /models carries no layer counts: say nothing rather than "0 layers".
    layers = f"{entry.n_layers:>3} layers" if entry.n_layers else " " * 10
    text.append(f"{size:>7.1f} GB {layers}", style="dim")
    # A column of its own, blank when the model has no tensor split, so "deployed" lines up.
    text.append("  tensor" if entry.supports_tensor else " " * 8, style="dim")
    if deployed:
        text.append("  deployed", style="yellow")
    return text


def _choice(options: Iterable[StrEnum], default: StrEnum, id: str) -> Select[str]:
    """A compact drop-down of an enum's values, ``default`` chosen."""
    return Select(
        [(o.value, o.value) for o in options],
        value=default.value,
        allow_blank=False,
        id=id,
        compact=True,
    )


class CreateScreen(MasterForm):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "submit", "Create"),
    ]

    def __init__(self, source: ClusterSource) -> None:
        super().__init__()
        self.source = source
        self.entries: list[ModelListEntry] = []
        self.shown: list[ModelListEntry] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="form") as dialog:
            dialog.border_title = "New deployment"
            dialog.border_subtitle = "esc cancel · ctrl+s create"
            yield Input(placeholder="search models…", id="search", compact=True)
            yield OptionList(id="catalog")
            yield Static("loading the catalog…", id="catalog-note", markup=False)
            with Horizontal(id="options"):
                yield Label("Sharding ")
                yield _choice(Sharding, Sharding.PIPELINE, "sharding")
                yield Label("  Instance ")
                yield _choice(InstanceMeta, InstanceMeta.MLX_RING, "meta")
                yield Label("  Min nodes ")
                yield Input("1", id="min-nodes", type="integer", compact=True, max_length=4)
            with Horizontal(id="options-replicas"):
                yield Label("Replicas ")
                yield Input("1", id="create-replicas", type="integer", compact=True, max_length=3)
                yield Label(f"  1-{MAX_REPLICAS}, each on nodes apart", classes="dim")
            yield Static("", id="form-error", markup=False)
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", compact=True)
                yield Button("Create", id="create", variant="primary", compact=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#search", Input).focus()
        self.load_catalog()

    @work(exclusive=True, group="catalog")
    async def load_catalog(self) -> None:
        search = self.query_one("#search", Input)
        try:
            self.entries = await self.source.models()
            search.placeholder = f"search the master's {len(self.entries)} models…"
        except ApiError as exc:
            self.entries = [model_entry(c) for c in BUILTIN_MODEL_CARDS]
            note = f"built-in catalog: /models failed ({exc.message})"
            search.placeholder = f"search the {note}"
            self.query_one("#catalog-note", Static).update(Text(note, style="yellow"))
        self._refilter()

    def _deployed(self) -> dict[str, str]:
        return {
            d.model_card.model_id: d.deployment_id
            for d in self.source.model.state.deployments.values()
        }

    def _refilter(self) -> None:
        query = self.query_one("#search", Input).value
        self.shown = search_models(self.entries, query)
        catalog = self.query_one("#catalog", OptionList)
        deployed = self._deployed()
        catalog.set_options(Option(_option_text(e, e.id in deployed), id=e.id) for e in self.shown)
        if self.shown:
            first_free = next((i for i, e in enumerate(self.shown) if e.id not in deployed), 0)
            catalog.highlighted = first_free
        # The hint follows the highlighted line; with no line, it says why the list is empty
        # (set_options does not announce a highlight that stays at the same index).
        self._show_fit()

    @on(Input.Changed, "#search")
    def _on_search(self) -> None:
        self._refilter()

    @on(Input.Submitted, "#search")
    def _on_search_done(self) -> None:
        self.query_one("#catalog", OptionList).focus()

    @on(OptionList.OptionHighlighted, "#catalog")
    @on(Input.Changed, "#create-replicas")
    def _show_fit(self) -> None:
        note = self.query_one("#catalog-note", Static)
        entry = self.chosen()
        if entry is not None:
            replicas = check_replicas(self.query_one("#create-replicas", Input).value)
            count = replicas if isinstance(replicas, int) else 1
            hint = fit_hint(entry, self.source.model.state, count)
            note.update(Text(hint, style="dim"))
        elif self.entries and not self.shown:
            query = self.query_one("#search", Input).value.strip()
            note.update(Text(no_match(query), style="yellow"))

    @on(OptionList.OptionSelected, "#catalog")
    def _on_model_chosen(self) -> None:
        self.query_one("#sharding", Select).focus()

    @on(Input.Submitted, "#min-nodes")
    @on(Input.Submitted, "#create-replicas")
    def _on_min_nodes_done(self) -> None:
        self.action_submit()

    @on(Button.Pressed, "#create")
    def _on_create(self) -> None:
        self.action_submit()

    def chosen(self) -> ModelListEntry | None:
        index = self.query_one("#catalog", OptionList).highlighted
        if index is None or not 0 <= index < len(self.shown):
            return None
        return self.shown[index]

    def action_submit(self) -> None:
        if self.sending:
            return
        result = validate_create(
            self.chosen(),
            str(self.query_one("#sharding", Select).value),
            str(self.query_one("#meta", Select).value),
            self.query_one("#min-nodes", Input).value,
            self._deployed(),
            self.query_one("#create-replicas", Input).value,
        )
        if isinstance(result, str):
            self._refuse(result)
            return
        self._sending(f"deploy {result.model_id}")
        self.post_message(CreateRequested(result, self._answered))
