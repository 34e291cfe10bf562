// chartrender renders a Helm chart the way `helm template` does, for the
// template features charts/podlink uses: Go text/template with the sprig
// functions, include, toYaml and fail, .Values from values.yaml deep-merged
// with -f files, .Release and .Chart. Helm is not a Debian package; this lets
// CI render the chart and exercise its validation. It is not Helm: only what
// the chart needs is implemented. With -notes it prints templates/NOTES.txt
// rendered (what `helm install` prints) instead of the manifests, after
// rendering them as Helm does (so validation still fails the render).
//
//	chartrender [-f values.yaml]... [-namespace NS] [-notes] CHART_DIR
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type fileList []string

func (f *fileList) String() string     { return strings.Join(*f, ",") }
func (f *fileList) Set(v string) error { *f = append(*f, v); return nil }

func readYAML(path string) (map[string]interface{}, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return m, nil
}

// merge copies over into base; maps merge key by key, anything else replaces.
func merge(base, over map[string]interface{}) {
	for k, v := range over {
		if vm, ok := v.(map[string]interface{}); ok {
			if bm, ok := base[k].(map[string]interface{}); ok {
				merge(bm, vm)
				continue
			}
		}
		base[k] = v
	}
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func main() {
	var files fileList
	flag.Var(&files, "f", "values file merged over the chart's values.yaml (repeatable)")
	namespace := flag.String("namespace", "default", "release namespace")
	name := flag.String("name", "release", "release name")
	notes := flag.Bool("notes", false, "print the rendered NOTES.txt instead of the manifests")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: chartrender [-f values.yaml]... [-namespace NS] [-notes] CHART_DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	values, err := readYAML(filepath.Join(dir, "values.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	for _, f := range files {
		over, err := readYAML(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "Error:", err)
			os.Exit(1)
		}
		merge(values, over)
	}
	chart, err := readYAML(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "templates", "*"))
	sort.Strings(paths)
	root := template.New("chart")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYAML
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	root.Funcs(funcs).Option("missingkey=zero")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "Error:", err)
			os.Exit(1)
		}
		if _, err := root.New(filepath.Base(p)).Parse(string(b)); err != nil {
			fmt.Fprintln(os.Stderr, "Error: parse:", err)
			os.Exit(1)
		}
	}
	data := map[string]interface{}{
		"Values":  values,
		"Release": map[string]interface{}{"Name": *name, "Namespace": *namespace, "Service": "Helm"},
		"Chart": map[string]interface{}{
			"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"],
		},
	}
	var out bytes.Buffer
	for _, p := range paths {
		base := filepath.Base(p)
		if strings.HasPrefix(base, "_") || !(strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml")) {
			continue
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, base, data); err != nil {
			fmt.Fprintln(os.Stderr, "Error: execution error at", err)
			os.Exit(1)
		}
		doc := strings.ReplaceAll(buf.String(), "<no value>", "")
		if strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")) == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: %v/templates/%s\n%s\n", chart["name"], base,
			strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")))
	}
	if *notes {
		out.Reset()
		if root.Lookup("NOTES.txt") == nil {
			fmt.Fprintln(os.Stderr, "Error: the chart has no templates/NOTES.txt")
			os.Exit(1)
		}
		if err := root.ExecuteTemplate(&out, "NOTES.txt", data); err != nil {
			fmt.Fprintln(os.Stderr, "Error: execution error at", err)
			os.Exit(1)
		}
	}
	os.Stdout.Write(out.Bytes())
}
