"""What the screen says, without the screen: each cell's words and style, the actions and their
keys, and the forms' rules. Pure (Rich text, no Textual widgets), so the words are tested
without a terminal; the widgets and screens above draw them (docs/design.md §9.1)."""
