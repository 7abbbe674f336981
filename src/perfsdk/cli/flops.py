"""``perfsdk flops MODEL``: FLOPs and MACs of a configuration, counted without weights."""

from __future__ import annotations

import json
from typing import Any

import click

from perfsdk.flops.count import count_model
from perfsdk.plugins import hookimpl

from perfsdk.fmt import fmt_count as _fmt


@click.command("flops")
@click.argument("model")
@click.option("--batch-size", "-b", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--input-tokens", "-t", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--output-tokens", "-g", default=32, show_default=True, type=click.IntRange(min=0),
              help="generated tokens; 0 counts one plain forward (logits for every position)")
@click.option("--images", default=None, type=click.IntRange(min=0),
              help="images per sequence of a vision-language model (their image tokens join the prompt) [default: 1]")
@click.option("--backend", default="torch", show_default=True, help="torch | ptflops | fvcore | analytic")
@click.option("--attn-implementation", default="auto", show_default=True, type=click.Choice(["auto", "sdpa", "eager"]),
              help="auto: the one transformers picks for the family (sdpa where supported, else eager)")
@click.option("--exact", is_flag=True, help="count every decode step instead of summing them in closed form")
@click.option("--full-depth", is_flag=True,
              help="instantiate every decoder layer instead of replicating the count of identical layers")
@click.option("--top", "top_n", default=10, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def flops_command(model: str, batch_size: int, input_tokens: int, output_tokens: int, images: int | None,
                  backend: str, attn_implementation: str, exact: bool, full_depth: bool, top_n: int,
                  as_json: bool) -> None:
    """Count the FLOPs of MODEL's generate without loading weights (meta device).

    MODEL is a folder with config.json, a config.json file, builtin:<name>, or a bundled
    architecture (gpt2, llama-2-7b, llama-3-8b, llama-3-70b, mistral-7b, mixtral-8x7b, qwen2-7b,
    tiny-llava, tiny-t5). Encoder-decoder and vision-language models add an encode phase (the
    encoder, or the vision tower and projector) to prefill and decode.
    """
    from perfsdk.flops.counter import BACKENDS, BackendUnavailable
    from perfsdk.models.arch import UnsupportedArchitecture
    from perfsdk.models.resolve import UnknownModel

    from perfsdk.suggest import did_you_mean
    from perfsdk.terminal import fail, make_console

    if backend not in BACKENDS:
        fail(f"--backend: unknown backend {backend!r}{did_you_mean(backend, BACKENDS)} "
             f"(available: {', '.join(BACKENDS)})")
    try:
        res = count_model(model, batch_size=batch_size, input_tokens=input_tokens, output_tokens=output_tokens,
                          backend=backend, attn_implementation=attn_implementation, exact=exact, top_n=top_n,
                          full_depth=full_depth, images=images)
    except (UnknownModel, UnsupportedArchitecture) as exc:
        fail(str(exc))
    except ValueError as exc:  # a shape the model cannot take (images for a text-only model)
        fail(str(exc))
    except BackendUnavailable as exc:
        fail(f"backend {backend}: {exc}", 1)
    except Exception as exc:
        fail(f"counting {model} with the {backend} backend failed: {exc}", 1)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    from rich.table import Table

    console = make_console()
    shape = f"{input_tokens} input"
    if res["images"]:
        shape += f" + {res['images']} image(s) x {res['image_tokens'] // res['images']} image tokens"
    t = Table(title=f"FLOPs of {model} — batch {batch_size}, {shape}, {output_tokens} output tokens")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("exact", justify="right")
    keys = ["flops_total", "flops_prefill", "flops_decode", "macs_total", "flops_per_output_token",
            "flops_per_decode_token", "analytic_flops_total"]
    if res["flops_encode"]:
        keys.insert(1, "flops_encode")
    for key in keys:
        v = res.get(key)
        t.add_row(key, _fmt(v), f"{v:,}" if isinstance(v, int) else (f"{v:,.1f}" if isinstance(v, float) else "-"))
    t.add_row("deviation_pct", "-" if res["deviation_pct"] is None else f"{res['deviation_pct']:+.4f} %",
              "FLAGGED" if res["deviation_flagged"] else "")
    t.add_row("decode_forwards", str(res["decode_forwards"]), "")
    t.add_row("backend / method", f"{res['backend']} / {res['method']}", "")
    console.print(t)
    if res["top_modules"]:
        m = Table(title="top modules")
        m.add_column("module")
        m.add_column("FLOPs", justify="right")
        m.add_column("share", justify="right")
        for row in res["top_modules"]:
            m.add_row(row["name"], _fmt(row["flops"]), f"{row['share_pct']:.2f} %")
        console.print(m)
    if res["by_category"]:
        k = Table(title="by operation category / module type")
        k.add_column("category / type")
        k.add_column("FLOPs", justify="right")
        k.add_column("share", justify="right")
        for row in res["by_category"]:
            k.add_row(row["name"], _fmt(row["flops"]), f"{row['share_pct']:.2f} %")
        for row in res["by_module_type"]:
            k.add_row(f"[dim]{row['name']}[/]", _fmt(row["flops"]), f"{row['share_pct']:.2f} %")
        console.print(k)
    console.print(f"convention: {res['convention']}")
    for n in res["notes"]:
        console.print(f"note: {n}")


@hookimpl
def perfsdk_register_commands(cli: Any) -> None:
    cli.add_command(flops_command)
