"""Sphinx extension: keep each page's scripts valid with no network and no kernel.

* Jupyter Book 1 loads ``sphinx-thebe`` (live code cells through a Binder
  kernel, fetched from unpkg.com). This book has no Binder and works offline,
  so thebe's scripts and stylesheet are left out of every page. With the
  versions pinned in ``requirements.txt`` its configuration script was also
  added twice per page, which is a JavaScript error
  (``Identifier 'THEBE_JS_URL' has already been declared``).
* Any other inline script that appears twice on a page is kept once.
"""


def _is_thebe(asset) -> bool:
    name = getattr(asset, "filename", None) or ""
    body = (getattr(asset, "attributes", None) or {}).get("body", "") or ""
    return "thebe" in name or "THEBE_JS_URL" in body


def _page_context(app, pagename, templatename, context, doctree):
    seen, scripts = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", None), (getattr(script, "attributes", None) or {}).get("body"))
        if _is_thebe(script) or key in seen:
            continue
        seen.add(key)
        scripts.append(script)
    context["script_files"] = scripts
    context["css_files"] = [c for c in context.get("css_files", []) if not _is_thebe(c)]


def setup(app):
    app.connect("html-page-context", _page_context, priority=900)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
