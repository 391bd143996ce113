"""``bno-hvd cli-reference``: every command and flag as Markdown (the docs page docs/cli.md)."""

from __future__ import annotations

import click


def command_reference(group: click.Group) -> str:
    ctx = click.Context(group, info_name="bno-hvd")
    lines = []
    for name in sorted(group.list_commands(ctx)):
        cmd = group.get_command(ctx, name)
        if cmd.hidden:
            continue
        lines.append(f"## `bno-hvd {name}`")
        lines.append(" ".join((cmd.help or "").split()))
        lines.append("")
        for param in cmd.params:
            if getattr(param, "hidden", False):  # e.g. train's --inject-fault, for tests only
                continue
            if isinstance(param, click.Argument):
                lines.append(f"- `{param.human_readable_name}` (argument)")
                continue
            flags = " / ".join(f"`{o}`" for o in param.opts + param.secondary_opts)
            extra = []
            if isinstance(param.type, click.Choice):
                extra.append("one of " + "|".join(param.type.choices))
            if param.default is not None and param.show_default and not param.is_flag:
                extra.append(f"default {param.default}")
            if param.is_flag and param.secondary_opts:
                extra.append(f"default {param.opts[0] if param.default else param.secondary_opts[0]}")
            tail = f" ({'; '.join(extra)})" if extra else ""
            if not param.help:
                raise ValueError(f"bno-hvd {name} {flags} has no help text; every flag needs one")
            lines.append(f"- {flags}: {param.help}{tail}")
        lines.append("")
    return "\n".join(lines)


@click.command("cli-reference", hidden=True)
def cli_reference():
    """Print the Markdown CLI reference that docs/cli.md embeds (launch/update-docs writes it)."""
    click.echo(command_reference(click.get_current_context().find_root().command))


COMMANDS = [cli_reference]
