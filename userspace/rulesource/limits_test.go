package rulesource

import (
	"testing"

	"github.com/xlimit/xlimit/userspace/config"
)

func TestMaxDocumentBytesIsConfigs(t *testing.T) {
	if MaxDocumentBytes != config.MaxDocumentBytes {
		t.Errorf("rulesource.MaxDocumentBytes %d, config.MaxDocumentBytes %d", MaxDocumentBytes, config.MaxDocumentBytes)
	}
}
