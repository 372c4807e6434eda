"""``DistributedEngine``: one model sharded over the ranks of ``mlxi launch``.

- :mod:`.engine`: rank 0's engine: the contract, collectives, failure and exit;
- :mod:`.ranks`: joining the group, sharing work, the loop the other ranks follow;
- :mod:`.control`: the side channel (heartbeats, exit orders) over TCP;
- :mod:`.launch`: starting the ranks of a program, watching them, a real exit code;
- :mod:`.stats`: the typed shapes of the engine's and each rank's figures.
"""
