from cyto.cli import main

main()
