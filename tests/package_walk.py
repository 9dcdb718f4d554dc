"""The package's public surface, walked once for the tests that check every member of it: every public function,
class and public method (bad input, low precision, per-model arguments, configuration containers)."""
import importlib
import inspect
import pkgutil

import lengthgen_utils


def public_callables():
    """Every public function, class and public method defined in the package: ``(qualified name, callable)``.

    The name is ``module.function`` or ``module.Class.method`` with the module's last component
    (``lengthgen_utils.run.cache`` -> ``cache``: module names are unique); private modules and names are left out.
    """
    for info in pkgutil.walk_packages(lengthgen_utils.__path__, prefix="lengthgen_utils."):
        short = info.name.rsplit(".", 1)[-1]
        if short.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            yield f"{short}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(member):
                        yield f"{short}.{name}.{attr}", member
