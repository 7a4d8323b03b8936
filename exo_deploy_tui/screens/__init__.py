"""The dashboard's screens: the main view and the dialogs it opens."""
