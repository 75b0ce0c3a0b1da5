from hydra_raytrain.cli import main

main()
