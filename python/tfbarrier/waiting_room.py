"""Where a listener keeps connections that have not yet proved they belong to the job (the driver link's,
spark/driver_link.py; a ring port's, exchange/ring_admission.py): at most PER_SOURCE from one address and LIMIT
in all wait at once, so a stranger's flood takes a few threads and descriptors and keeps out no other address.
Whoever was turned away (no room, or no proof) is counted by address. Standard library only."""

import collections
import threading

PER_SOURCE = 8  # connections from one address that may wait to prove themselves at once
LIMIT = 64  # such connections from all addresses


class WaitingRoom:
    def __init__(self):
        self.turned_away = collections.Counter()  # address -> connections refused: no room, or no proof
        self._waiting, self._lock = {}, threading.Lock()  # connection -> its address, until it leaves

    def enter(self, connection, source):
        """Whether ``connection`` from address ``source`` may wait to prove itself (counted as turned away if not)."""
        with self._lock:
            room = (len(self._waiting) < LIMIT
                    and sum(waiting == source for waiting in self._waiting.values()) < PER_SOURCE)
            if room:
                self._waiting[connection] = source
            else:
                self.turned_away[source] += 1
        return room

    def leave(self, connection):
        """``connection`` proved itself, was refused or ended: it waits no more (again: nothing)."""
        with self._lock:
            self._waiting.pop(connection, None)

    def full(self):
        with self._lock:
            return len(self._waiting) >= LIMIT

    def turn_away(self, source):
        """A connection from ``source`` that did not prove itself."""
        with self._lock:
            self.turned_away[source] += 1

    def describe(self):
        """Who was turned away, the most first ("300 from 10.0.0.7, 2 from 10.0.0.9"), or ""."""
        with self._lock:
            return ", ".join(f"{count} from {address}" for address, count in self.turned_away.most_common(5))
