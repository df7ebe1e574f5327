"""The console's answer in a form an operator can use: the resolution as an mlx_lm.server
command line and as the environment variable. Pure: values in, values out."""

from __future__ import annotations

from typing import Any


def server_command(res: Any, paths: Any) -> tuple[str, str] | None:
    """(the server command line, ``BLOCKWIDTH_DRAFT_BLOCK_SIZE=N``) for a resolved width; None
    when there is no width (a decline decodes classically, or nothing is resolved yet)."""
    if res is None or res.width is None:
        return None
    env = f"BLOCKWIDTH_DRAFT_BLOCK_SIZE={res.width}"
    if paths.drafter is None:
        return (f"# mlx_lm.server has no prompt-lookup drafter; width {res.width} applies to "
                f"blockwidth's engine only", env)
    from console.serve import command_for  # the command resolve --json gives (issue 27)

    # the mlx_lm.server command, with the arguments a served-path entry was measured with
    return command_for(res, paths.target, paths.drafter)["mlx-lm-server"]["line"], env
