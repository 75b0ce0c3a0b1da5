"""``python -m hydra_raytrain.evaluate``: the command's address. Its code is ``hydra_raytrain.inference.evaluate``,
in the wing of the package that reads finished runs."""

from hydra_raytrain.inference.evaluate import main

if __name__ == "__main__":
    main()
