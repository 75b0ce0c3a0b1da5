"""``python -m hydra_raytrain.serve``: the command's address. Its code is ``hydra_raytrain.inference.serve``,
in the wing of the package that reads finished runs."""

from hydra_raytrain.inference.serve import main

if __name__ == "__main__":
    main()
