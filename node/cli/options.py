"""Click parameter types shared by several commands.

:data:`LINK_SPEC` takes a link spec (node/p2p/link.py) such as ``rtt=60ms,up=20mbit``: the
value stays the string given (it goes into daemons' configs as is), and a malformed one is a
usage error that names the bad part, raised while the command line is parsed, before the
command starts any daemon.
"""

from __future__ import annotations

import click

from node.p2p.link import LinkSpecError, parse_link


class LinkSpecParam(click.ParamType):
    name = "SPEC"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        text = str(value)
        try:
            parse_link(text)
        except LinkSpecError as exc:
            self.fail(str(exc), param, ctx)
        return text


LINK_SPEC = LinkSpecParam()
