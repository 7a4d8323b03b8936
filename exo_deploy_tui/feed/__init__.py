"""The dashboard's feed: its connection to a master or a stock exo, over HTTP, and the reading of
what they answer. No Textual: it hands plain messages (``model.updates``) to the model
(docs/design.md §9.1)."""
