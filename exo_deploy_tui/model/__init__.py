"""The dashboard's pure model of the cluster: the State the feed brings, what the master no
longer says (a part per concern), and the rows, timeline and words derived from them. No
Textual, no I/O, no clock: every method takes ``now`` (docs/design.md §9.1). ``cluster`` holds
``ClusterModel``, the one the app drives."""
