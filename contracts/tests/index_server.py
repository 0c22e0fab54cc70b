"""A local package index for the publishing test: pypiserver, uploads need credentials.

    python index_server.py PACKAGES_DIR PORT   # credentials in PIN_INDEX_USER/PIN_INDEX_PASSWORD

pypiserver's own command line checks upload credentials against an htpasswd file (which needs
passlib); its application factory takes the check as a function instead.
"""

from __future__ import annotations

import os
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pypiserver


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("index: " + (format % args) + "\n")


def main() -> None:
    root, port = sys.argv[1], int(sys.argv[2])
    user, password = os.environ["PIN_INDEX_USER"], os.environ["PIN_INDEX_PASSWORD"]
    app = pypiserver.app(
        roots=[root],
        authenticate=["update"],  # reading is open, uploading needs the credentials
        auther=lambda u, p: (u, p) == (user, password),
        overwrite=False,  # a published version is final, as on PyPI
    )
    make_server("127.0.0.1", port, app, handler_class=_QuietHandler).serve_forever()


if __name__ == "__main__":
    main()
