"""mkdocs hook: show figures the repository already commits under reports/, without a second copy.

The docs live in `docs/`, the example reports' figures in `reports/`; mkdocs only serves files from
its docs directory. Rather than commit each figure twice, this hook adds the few the pages show as
files of the built site under `img/`. A figure that is gone fails the build with its path.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# site path -> the committed file it is built from
IMAGES = {
    "img/compare_gaps.png": "reports/example-sweep-rag-inject32k/figures/compare_gaps.png",
    "img/compare_tradeoff.png": "reports/example-sweep-rag-inject32k/figures/compare_tradeoff.png",
    "img/stalls.png": "reports/example-rag-inject32k/figures/stalls.png",
    "img/engine_steps.png": "reports/example-rag-inject32k/figures/engine_steps.png",
    "img/scrape-effect.png": "reports/vllm-cpu/scrape-effect.png",
}


def on_files(files, config):  # noqa: ANN001, ANN201 - mkdocs hook signature
    """Add each figure as a site file; a missing one is an error naming it."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    for site_path, repo_path in IMAGES.items():
        source = ROOT / repo_path
        if not source.is_file():
            raise PluginError(f"docs/repo_images.py: {repo_path} is not in the repository; "
                              f"restore it or drop {site_path} from IMAGES and the pages")
        files.append(File.generated(config, site_path, abs_src_path=str(source)))
    return files
