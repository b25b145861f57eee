// Package readmetest holds the test that compiles every Go block of the
// repository's README.md against the module's current code.
//
// The convention it checks: every block fenced as ```go in README.md is a
// complete, gofmt-formatted Go file (it begins with a package clause and
// imports what it uses). A block of package main is built as a program;
// any other package is built as a library. Each block is built alone, as
// the one file of a package that exists only in a go build overlay, so
// nothing is written into the working tree.
package readmetest
