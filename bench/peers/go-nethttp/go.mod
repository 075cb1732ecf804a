module tern.bench/go-nethttp

go 1.22
