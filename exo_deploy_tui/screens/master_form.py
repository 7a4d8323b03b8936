"""What the create and scale forms share: one request at a time, kept open until the master answers.

A form posts its request with ``_answered`` as the reply; while a request is out it ignores
further submits. The master's acceptance closes the form; a refusal is shown verbatim in
``#form-error`` so the operator can fix one field and resend.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class MasterForm(ModalScreen[None]):
    def __init__(self) -> None:
        super().__init__()
        self.sending = False

    @on(Button.Pressed, "#cancel")
    def _on_cancel(self) -> None:
        self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _show_error(self, text: Text) -> None:
        self.query_one("#form-error", Static).update(text)

    def _refuse(self, reason: str) -> None:
        self._show_error(Text(f"✖ {reason}", style="bold red"))

    def _sending(self, what: str) -> None:
        """Mark the request as out, saying what it is."""
        self._show_error(Text(f"sending: {what}…", style="dim"))
        self.sending = True

    def _answered(self, refused: str | None) -> None:
        self.sending = False
        if not self.is_attached:
            return  # cancelled while the master was answering
        if refused is None:
            self.dismiss(None)
            return
        self._refuse(f"The master refused: {refused}")
