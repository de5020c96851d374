"""MkDocs hook: the reference pages' generated parts, from the code itself, so they cannot
drift: ``<!-- generated: NAME -->`` in a page becomes what ``GENERATORS[NAME]`` returns."""

from __future__ import annotations

import re

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


def _help_block(text: str) -> str:
    return "```text\n" + text.rstrip() + "\n```\n"


def member_job() -> str:
    from airflow_provider_cg.core.landing.contract import job_parser

    return _help_block(job_parser().format_help())


def cg_commands() -> str:
    from airflow_provider_cg.core.tools.cli_parser import build_commands

    parser, commands = build_commands()
    out = [_help_block(parser.format_help())]
    for name, command in commands.items():
        out.append(f"## `cg {name}`\n\n{_help_block(command.format_help())}")
    return "\n".join(out)


def exit_codes() -> str:
    from airflow_provider_cg.core.landing import contract

    rows = [("exit", "meaning"),
            (str(contract.EXIT_OK), "the run ended as its summary says (`result`)"),
            (str(contract.EXIT_INVALID), "bad input: the message names the field and the rule; nothing was "
                                         "written or acknowledged; retrying cannot help"),
            (str(contract.EXIT_SERVER), "a server (NATS, the sink's storage or database) refused or could not be "
                                        "reached: retrying may help")]
    results = [("result", "the task")] + [(f"`{r}`", "skipped" if r in contract.SKIP_RESULTS else "succeeds"
                                           if r == contract.RESULT_COMMITTED else "fails")
                                          for r in (contract.RESULT_COMMITTED, contract.RESULT_EMPTY,
                                                    contract.RESULT_NOT_PINNED, contract.RESULT_REVOKED,
                                                    contract.RESULT_FAILED)]

    def table(rs: list[tuple[str, str]]) -> str:
        head, *body = rs
        return "\n".join([f"| {head[0]} | {head[1]} |", "|---|---|", *(f"| {a} | {b} |" for a, b in body)]) + "\n"

    return table(rows) + "\n" + table(results)


def connection_fields() -> str:
    """The ``nats`` connection's form: the standard fields as relabelled, then the extra fields,
    from the provider info the form is built from."""
    from airflow_provider_cg._provider_info import CONN_FIELDS, UI_FIELD_BEHAVIOUR

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| field | stored as | what it holds | secret |", "|---|---|---|---|"]
    for std, label in (("host", "Host(s)"), ("port", "Port"), ("schema", "URL scheme"), ("login", "User"),
                       ("password", "Password")):
        label = UI_FIELD_BEHAVIOUR["relabeling"].get(std, label)
        example = UI_FIELD_BEHAVIOUR["placeholders"].get(std, "")
        rows.append(f"| {label} | the connection's `{std}` | {cell(f'e.g. `{example}`' if example else '')} | "
                    f"{'yes' if std == 'password' else ''} |")
    for name, field in CONN_FIELDS.items():
        secret = field["schema"].get("format") == "password"
        rows.append(f"| {field['label']} | extra `{name}` | {cell(field.get('description', ''))} | {'yes' if secret else ''} |")
    return "\n".join(rows) + "\n"


def metrics() -> str:
    """The consumer-lag metrics (``airflow_provider_cg/metrics.py``), as a table."""
    from airflow_provider_cg.metrics import METRICS

    rows = ["| Prometheus name | StatsD name's last part | type | unit | what it is |", "|---|---|---|---|---|"]
    for name, spec in METRICS.items():
        short = name.removeprefix("cg_").removeprefix("group_").removeprefix("member_").removesuffix("_total")
        who = "member" if name.startswith("cg_member_") else "connection" if name == "cg_connection_up" else "group"
        rows.append(f"| `{name}` | `{short}` ({who}) | {spec.kind} | {spec.unit} | {spec.help} |")
    return "\n".join(rows) + "\n"


def public_api() -> str:
    """Each public module and the names its ``__all__`` states (``airflow_provider_cg.PUBLIC_MODULES``)."""
    import importlib

    from airflow_provider_cg import PUBLIC_MODULES

    return "\n".join(f"| `{m}` | {', '.join(f'`{n}`' for n in importlib.import_module(m).__all__)} |"
                     for m in PUBLIC_MODULES) + "\n"


GENERATORS = {"public-api": public_api, "member-job": member_job, "cg": cg_commands, "exit-codes": exit_codes,
              "connection-fields": connection_fields, "metrics": metrics}


def on_files(files, config):  # noqa: ARG001 - MkDocs' hook signature
    """The benchmarks' plots, where the performance page links them (``benchmarks/results/``):
    the files ``make bench`` writes, not copies of them."""
    from pathlib import Path

    from mkdocs.structure.files import File

    root = Path(config["config_file_path"]).parent
    for plot in sorted((root / "benchmarks" / "results").glob("*.png")):
        files.append(File(f"benchmarks/results/{plot.name}", src_dir=str(root), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
