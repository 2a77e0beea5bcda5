"""Where the service's own actors run: the API replicas and the job controller stay on the Ray
head node, so worker nodes carry only the work (Ray Data, Ray Train, merges, batch engines) and
can come and go (a lost worker node must never take the API or the controller with it).

Ray gives the head node, and only it, the resource `node:__internal_head__` (1.0); asking for a
sliver of it pins an actor there and costs nothing else. A one-node laptop cluster is its own
head, so the same request works there.
"""

from __future__ import annotations

HEAD_NODE_RESOURCES = {"node:__internal_head__": 0.001}
