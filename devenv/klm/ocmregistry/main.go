// Command ocm-registry is the OCI registry the real lifecycle-manager reads modules from in
// devenv, and the push that puts a module there in the layout modulectl and `ocm transfer`
// produce, so that lifecycle-manager's own OCM code (not ours) decides whether it is right.
//
//	ocm-registry serve [--address 127.0.0.1:0]
//	    an in-memory registry (go-containerregistry's); prints its host:port as the first line
//	ocm-registry push --registry HOST:PORT --component NAME --version V --manifest FILE
//	    the component version NAME:V with FILE as its raw-manifest resource, at
//	    HOST:PORT/component-descriptors/NAME:V (--resource-name: another name for it, a layout
//	    KLM must refuse)
//	ocm-registry push-image --registry HOST:PORT --archive FILE --reference REPO:TAG
//	    the one image of an OCI image layout archive (devenv.node.images') at HOST:PORT/REPO:TAG,
//	    for a kubelet on a real node to pull (lifecycle-manager's skr-webhook image)
//
// It is built inside lifecycle-manager's module (devenv/klm/build.sh), so the registry and
// client are the go-containerregistry release lifecycle-manager pins.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The media types and names of OCM's OCI mapping (ocm.software/ocm
// api/ocm/extensions/repositories/genericocireg/componentmapping).
const (
	descriptorNamespace = "component-descriptors"
	descriptorFile      = "component-descriptor.yaml"
	descriptorTarType   = "application/vnd.ocm.software.component-descriptor.v2+yaml+tar"
	configType          = "application/vnd.ocm.software.component.config.v1+json"
	// modulectl adds the manifest as a `dir` input, which OCM stores as a tar of the folder.
	rawManifestType = "application/x-tar"
	rawManifestName = "raw-manifest"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: ocm-registry serve|push [flags]")
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "push":
		err = push(os.Args[2:])
	case "push-image":
		err = pushImage(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (serve, push or push-image)", os.Args[1])
	}
	if err != nil {
		log.Fatalf("ocm-registry: %v", err)
	}
}

func serve(args []string) error {
	flags := flag.NewFlagSet("serve", flag.ExitOnError)
	address := flags.String("address", "127.0.0.1:0", "where to listen")
	_ = flags.Parse(args)
	listener, err := net.Listen("tcp", *address)
	if err != nil {
		return err
	}
	// The caller reads the port from this line; nothing else goes to stdout.
	fmt.Println(listener.Addr().String())
	server := &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}
	return server.Serve(listener)
}

// The v2 component descriptor, as much of it as a module carries.
type descriptor struct {
	Meta struct {
		SchemaVersion string `json:"schemaVersion"`
	} `json:"meta"`
	Component component `json:"component"`
}

type component struct {
	Name                string              `json:"name"`
	Version             string              `json:"version"`
	Provider            string              `json:"provider"`
	RepositoryContexts  []repositoryContext `json:"repositoryContexts"`
	Sources             []any               `json:"sources"`
	ComponentReferences []any               `json:"componentReferences"`
	Resources           []resource          `json:"resources"`
}

type repositoryContext struct {
	Type                 string `json:"type"`
	BaseURL              string `json:"baseUrl"`
	ComponentNameMapping string `json:"componentNameMapping"`
}

type resource struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	Type     string `json:"type"`
	Relation string `json:"relation"`
	Access   access `json:"access"`
}

type access struct {
	Type           string `json:"type"`
	LocalReference string `json:"localReference"`
	MediaType      string `json:"mediaType"`
}

func push(args []string) error {
	flags := flag.NewFlagSet("push", flag.ExitOnError)
	host := flags.String("registry", "", "host:port of the registry")
	componentName := flags.String("component", "", "the OCM component name (module-config.yaml name)")
	version := flags.String("version", "", "the component version (module-config.yaml version)")
	manifestPath := flags.String("manifest", "", "the raw manifest, one multi-document YAML")
	provider := flags.String("provider", "kyma-project.io", "the component's provider")
	// KLM renders the resource of this name; another name is a component it cannot install.
	resourceName := flags.String("resource-name", rawManifestName, "the manifest's resource name")
	_ = flags.Parse(args)
	if *host == "" || *componentName == "" || *version == "" || *manifestPath == "" {
		return errors.New("push needs --registry, --component, --version and --manifest")
	}
	manifest, err := os.ReadFile(*manifestPath)
	if err != nil {
		return err
	}
	rawTar, err := tarOf(filepath.Base(*manifestPath), manifest)
	if err != nil {
		return err
	}
	rawLayer := static.NewLayer(rawTar, rawManifestType)
	rawDigest, err := rawLayer.Digest()
	if err != nil {
		return err
	}
	var desc descriptor
	desc.Meta.SchemaVersion = "v2"
	desc.Component = component{
		Name:     *componentName,
		Version:  *version,
		Provider: *provider,
		RepositoryContexts: []repositoryContext{
			{Type: "OCIRegistry", BaseURL: *host, ComponentNameMapping: "urlPath"},
		},
		Sources:             []any{},
		ComponentReferences: []any{},
		Resources: []resource{{
			Name:     *resourceName,
			Version:  *version,
			Type:     "directoryTree",
			Relation: "local",
			Access:   access{Type: "localBlob", LocalReference: rawDigest.String(), MediaType: rawManifestType},
		}},
	}
	// JSON is YAML: OCM decodes the file with a YAML decoder.
	descJSON, err := json.Marshal(desc)
	if err != nil {
		return err
	}
	descTar, err := tarOf(descriptorFile, descJSON)
	if err != nil {
		return err
	}
	descLayer := static.NewLayer(descTar, descriptorTarType)
	descDescriptor, err := describe(descLayer, descriptorTarType)
	if err != nil {
		return err
	}
	config, err := json.Marshal(map[string]v1.Descriptor{"componentDescriptorLayer": descDescriptor})
	if err != nil {
		return err
	}
	configLayer := static.NewLayer(config, configType)

	ref, err := name.ParseReference(
		fmt.Sprintf("%s/%s/%s:%s", *host, descriptorNamespace, *componentName, *version), name.Insecure)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	manifestDoc := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1}
	for i, layer := range []v1.Layer{configLayer, descLayer, rawLayer} {
		if err := remote.WriteLayer(ref.Context(), layer, remote.WithContext(ctx)); err != nil {
			return err
		}
		mediaType, err := layer.MediaType()
		if err != nil {
			return err
		}
		d, err := describe(layer, mediaType)
		if err != nil {
			return err
		}
		if i == 0 {
			manifestDoc.Config = d
		} else {
			manifestDoc.Layers = append(manifestDoc.Layers, d)
		}
	}
	body, err := json.Marshal(manifestDoc)
	if err != nil {
		return err
	}
	return remote.Put(ref, rawManifest(body), remote.WithContext(ctx))
}

func pushImage(args []string) error {
	flags := flag.NewFlagSet("push-image", flag.ExitOnError)
	host := flags.String("registry", "", "host:port of the registry")
	archive := flags.String("archive", "", "an OCI image layout archive holding one image")
	reference := flags.String("reference", "", "REPO:TAG to push it as")
	_ = flags.Parse(args)
	if *host == "" || *archive == "" || *reference == "" {
		return errors.New("push-image needs --registry, --archive and --reference")
	}
	dir, err := os.MkdirTemp("", "ocm-registry-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := untar(*archive, dir); err != nil {
		return err
	}
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return err
	}
	found, err := index.IndexManifest()
	if err != nil {
		return err
	}
	if len(found.Manifests) != 1 {
		return fmt.Errorf("%s holds %d images, not one", *archive, len(found.Manifests))
	}
	image, err := index.Image(found.Manifests[0].Digest)
	if err != nil {
		return err
	}
	ref, err := name.ParseReference(*host+"/"+*reference, name.Insecure)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return remote.Write(ref, image, remote.WithContext(ctx))
}

// untar writes the archive's regular files under dir (an image layout has nothing else).
func untar(archive, dir string) error {
	file, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer file.Close()
	reader := tar.NewReader(file)
	for {
		header, err := reader.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if header.Typeflag != tar.TypeReg {
			continue
		}
		target := filepath.Join(dir, filepath.Clean("/"+header.Name))
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, reader) //nolint:gosec // an archive devenv wrote itself
		if closeErr := out.Close(); err == nil {
			err = closeErr
		}
		if err != nil {
			return err
		}
	}
}

type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

func describe(layer v1.Layer, mediaType types.MediaType) (v1.Descriptor, error) {
	digest, err := layer.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	size, err := layer.Size()
	if err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: mediaType, Digest: digest, Size: size}, nil
}

func tarOf(fileName string, content []byte) ([]byte, error) {
	var buf bytes.Buffer
	writer := tar.NewWriter(&buf)
	header := &tar.Header{Name: fileName, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}
	if err := writer.WriteHeader(header); err != nil {
		return nil, err
	}
	if _, err := writer.Write(content); err != nil {
		return nil, err
	}
	if err := writer.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
