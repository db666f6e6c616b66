"""`python -m kpgo.sim`: build what simulated boots need (the QEMU plugin and the guest's window
tool, fetching the plugin header once); scripts/setup.sh runs it. Prints where they are."""

from __future__ import annotations

import sys

from kpgo import sim
from kpgo.errors import KpgoError


def main() -> int:
    try:
        plugin, window = sim.setup()
    except KpgoError as e:
        print(f"kpgo: error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"sim: plugin {plugin}")
    print(f"sim: guest window tool {window}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
