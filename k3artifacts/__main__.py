from k3artifacts.cli import main

main()
