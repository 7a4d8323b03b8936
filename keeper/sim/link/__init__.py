"""The node <-> master link: the JSON protocol and the channel that carries it (a WebSocket in
processes, memory streams in virtual time). Both ends import it; neither imports the other.
"""
