package relayhub_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// module is the import path of this module, the prefix of its packages.
const module = "github.com/relayhub/relayhub"

// TestImportsRunDownTheCodeMap holds the packages to README.md's code map:
// every package has a row, and a package imports only packages of its own
// row or of rows below it. Only the files a package is built from count;
// a package's tests may import what they need.
func TestImportsRunDownTheCodeMap(t *testing.T) {
	rows := codeMapRows(t)
	imports := packageImports(t)

	var pkgs []string
	for pkg := range imports {
		pkgs = append(pkgs, pkg)
	}
	slices.Sort(pkgs)
	for _, pkg := range pkgs {
		row, ok := rows[pkg]
		if !assert.True(t, ok, "package %s has no row in README.md's code map", pkg) {
			continue
		}
		for _, imp := range imports[pkg] {
			impRow, ok := rows[imp]
			if ok && impRow < row {
				t.Errorf("%s imports %s, which stands above it in README.md's code map", pkg, imp)
			}
		}
	}
	for pkg := range rows {
		assert.Contains(t, imports, pkg, "README.md's code map names %s, which is no package of this module", pkg)
	}
}

// codeMapRows returns each package README.md's code map names, relative to
// the module, with the index of its row: 0 for the top one.
func codeMapRows(t *testing.T) map[string]int {
	t.Helper()
	body, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(body), "\n## Code map\n")
	require.True(t, ok, "README.md has no Code map section")
	section, _, _ = strings.Cut(section, "\n## ")
	name := regexp.MustCompile("`([^`]+)`")
	rows := make(map[string]int)
	row := 0
	for line := range strings.Lines(section) {
		cells := strings.Split(line, "|")
		// A table row is | package(s) | its job |; the header names no
		// package in backquotes and the rule row none at all.
		if len(cells) < 3 || !strings.HasPrefix(line, "|") {
			continue
		}
		found := name.FindAllStringSubmatch(cells[1], -1)
		if len(found) == 0 {
			continue
		}
		for _, m := range found {
			_, dup := rows[m[1]]
			require.False(t, dup, "README.md's code map names %s twice", m[1])
			rows[m[1]] = row
		}
		row++
	}
	require.NotEmpty(t, rows, "README.md's code map has no rows")
	return rows
}

// packageImports returns, for each package of the module, relative to the
// module ("." for none at its root), the packages of the module its
// non-test files import. A directory with only test files is no package.
func packageImports(t *testing.T) map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	imports := make(map[string][]string)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		if _, ok := imports[pkg]; !ok {
			imports[pkg] = nil
		}
		for _, spec := range f.Imports {
			p, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return err
			}
			if rel, ok := strings.CutPrefix(p, module+"/"); ok && !slices.Contains(imports[pkg], rel) {
				imports[pkg] = append(imports[pkg], rel)
			}
		}
		return nil
	})
	require.NoError(t, err)
	return imports
}
