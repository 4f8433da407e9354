package registry

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"testing"
)

// descriptor is the part of an OCI descriptor Push reads.
type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// index is an OCI image index (index.json of a layout, or a blob).
type index struct {
	MediaType string       `json:"mediaType"`
	Manifests []descriptor `json:"manifests"`
}

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
)

// Push uploads the image of an OCI layout archive (what realnode's images
// are: index.json naming one image index or manifest) to the registry as
// repository:tag, over the distribution API (monolithic blob uploads, then
// the manifests, children first), and returns its reference and the bytes
// of its blobs that are neither manifests nor indexes (what a pull fetches
// beyond them: config and layers).
func (r *Registry) Push(t testing.TB, archive, repository, tag string) (ref string, content int64) {
	t.Helper()
	blobs, top, err := readLayout(archive)
	if err != nil {
		t.Fatalf("registry push %s: %v", archive, err)
	}
	manifests := map[string]string{} // digest -> media type
	var walk func(d descriptor) error
	var order []descriptor
	walk = func(d descriptor) error {
		manifests[d.Digest] = d.MediaType
		if d.MediaType == mediaIndex {
			var ix index
			if err := json.Unmarshal(blobs[d.Digest], &ix); err != nil {
				return fmt.Errorf("index %s: %v", d.Digest, err)
			}
			for _, c := range ix.Manifests {
				if err := walk(c); err != nil {
					return err
				}
			}
		}
		order = append(order, d) // children before their index
		return nil
	}
	if err := walk(top); err != nil {
		t.Fatalf("registry push %s: %v", archive, err)
	}
	for dg, b := range blobs {
		if _, ok := manifests[dg]; ok {
			continue
		}
		if err := r.putBlob(repository, dg, b); err != nil {
			t.Fatalf("registry push %s: %v", archive, err)
		}
		content += int64(len(b))
	}
	for i, d := range order {
		reference := d.Digest
		if i == len(order)-1 {
			reference = tag
		}
		if err := r.putManifest(repository, reference, d.MediaType, blobs[d.Digest]); err != nil {
			t.Fatalf("registry push %s: %v", archive, err)
		}
	}
	return r.Host + "/" + repository + ":" + tag, content
}

// readLayout reads an OCI layout tar: its blobs by digest and the one
// descriptor of index.json.
func readLayout(archive string) (map[string][]byte, descriptor, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, descriptor{}, err
	}
	defer f.Close()
	blobs := map[string][]byte{}
	var ix index
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, descriptor{}, err
		}
		name := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, descriptor{}, err
		}
		switch {
		case name == "index.json":
			if err := json.Unmarshal(b, &ix); err != nil {
				return nil, descriptor{}, fmt.Errorf("index.json: %v", err)
			}
		case strings.HasPrefix(name, "blobs/sha256/"):
			blobs["sha256:"+path.Base(name)] = b
		}
	}
	if len(ix.Manifests) != 1 {
		return nil, descriptor{}, fmt.Errorf("index.json names %d images, want 1", len(ix.Manifests))
	}
	top := ix.Manifests[0]
	if top.MediaType != mediaIndex && top.MediaType != mediaManifest {
		return nil, descriptor{}, fmt.Errorf("index.json: media type %q is neither an image index nor a manifest", top.MediaType)
	}
	if _, ok := blobs[top.Digest]; !ok {
		return nil, descriptor{}, fmt.Errorf("index.json names %s, which the layout lacks", top.Digest)
	}
	return blobs, top, nil
}

// putBlob uploads one blob in a single request after opening the upload.
func (r *Registry) putBlob(repository, digest string, b []byte) error {
	resp, err := http.Post("http://"+r.Host+"/v2/"+repository+"/blobs/uploads/", "application/octet-stream", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("opening the upload of %s: %s", digest, resp.Status)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		return fmt.Errorf("upload location %q: %v", resp.Header.Get("Location"), err)
	}
	loc = resp.Request.URL.ResolveReference(loc)
	q := loc.Query()
	q.Set("digest", digest)
	loc.RawQuery = q.Encode()
	return r.put(loc.String(), "application/octet-stream", b, http.StatusCreated)
}

func (r *Registry) putManifest(repository, reference, mediaType string, b []byte) error {
	return r.put("http://"+r.Host+"/v2/"+repository+"/manifests/"+reference, mediaType, b, http.StatusCreated)
}

func (r *Registry) put(u, contentType string, b []byte, want int) error {
	req, err := http.NewRequest(http.MethodPut, u, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("PUT %s: %s: %s", u, resp.Status, msg)
	}
	return nil
}
