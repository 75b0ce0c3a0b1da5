"""``python -m hydra_raytrain.export``: the command's address. Its code is ``hydra_raytrain.inference.export``,
in the wing of the package that reads finished runs."""

from hydra_raytrain.inference.export import main

if __name__ == "__main__":
    main()
