"""``rte play``: a browser front end to a daemon, one session per tab.

- :mod:`rte.play.server` — the page and its WebSockets on 127.0.0.1, signals, the ready line
- :mod:`rte.play.gateway` — tabs in, one asyncio client of the daemon out
- :mod:`rte.play.daemon` — the daemon it launches when no ``--name`` is given
- ``page.html`` — the page: a canvas, the overlay, keys, the prompt box, Reset

Everything here needs aiohttp (``pip install 'rte[play]'``); importing this
package alone does not import it.
"""
